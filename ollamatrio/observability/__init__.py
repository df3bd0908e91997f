"""What the server tells about itself: Prometheus ``/metrics`` and the ``/api/events`` stream."""
