"""The HTTP transport: the raw-Trio front door and its HTTP/1.1 framing, the ASGI exchange,
CORS and the host guard, and shutdown's drain.  It knows no API: routes come from the app it
serves (``api/``), which may say which request bodies to limit before reading
(:class:`front.BodyLimits`)."""
