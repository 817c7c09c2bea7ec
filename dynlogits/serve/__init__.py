"""Serving: the frontend and worker processes, what they exchange (``protocol``), and the HTTP layer
they share (``http``)."""
