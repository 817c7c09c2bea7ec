"""Tools around the product: benchmarks (``bench``), load (``load``), the embedded model
(``model_builder``) and the ``dynlogits`` command (``cli``)."""
