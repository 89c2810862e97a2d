"""``jobfence serve``: the operators' console and the JSON HTTP API under ``/api/v1/``,
one stateless process reading and writing only through the store. ``auth`` decides who
calls and what they may do; ``api`` holds the routes; ``openapi`` describes them; the
console is static files (``static/``) that call the API like any client."""
