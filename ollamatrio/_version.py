__version__ = "0.1.0"

# The Ollama release whose API behaviour the server matches (the spec it is built and tested
# against).  ``/api/version`` reports it as ``version``, since clients gate features on that
# number (Codex CLI refuses a server older than 0.13.4); the project's own version is
# reported beside it as ``ollamatrio``.
OLLAMA_API_VERSION = "0.24.0"
