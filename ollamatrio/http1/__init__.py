"""HTTP/1.1 below the engines and the fleet: ``framing.py`` (header grammar, response heads,
chunked bodies read as h11 reads them), shared by the server's front door and the clients,
and ``client.py`` (a keep-alive pool over raw Trio streams, to a runner or to a host)."""
