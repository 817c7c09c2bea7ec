"""Tools around the product: benchmarks (``bench``), load (``load``) and the ``dynlogits`` command
(``cli``)."""
