"""A reference model of a job's life (``life``), written from the product contract and
docs/REFERENCE.md, and the stateful test machine (``machine``) that drives the real store on
a real PostgreSQL against it."""
