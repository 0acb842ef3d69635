"""Serving the built model through OpenAI's API: sessions per backend, text handling, the HTTP server."""
