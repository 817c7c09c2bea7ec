"""The HTTP layer the frontend and the workers share: connections and request heads, untrusted
bodies, credentials, client protocol errors."""
