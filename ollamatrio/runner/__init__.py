"""The runner child process: one model in llama.cpp's HTTP server on a private Unix socket.

Run as ``python -m ollamatrio.runner``; :mod:`ollamatrio.engines.process` is its client.
This package imports nothing above itself except the fact modules (errors, gguf, protocol).
"""
