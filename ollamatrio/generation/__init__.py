"""The generation core every API dialect shares: a generation's lease and engine stream (the
relay), and the load-progress lines of a request waiting for its model."""
