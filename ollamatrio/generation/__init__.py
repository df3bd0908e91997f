"""The generation core every API dialect shares: the typed requests a dialect translates
into (``requests``), the engine's completion request built from them (``completion``), a
generation's lease and engine stream (``relay``), its folded answer (``answer``), and the
load-progress lines of a request waiting for its model (``load_lines``)."""
