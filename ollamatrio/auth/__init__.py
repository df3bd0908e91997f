"""Who is asking: API keys, their scopes and limits (docs/security.md)."""
