"""Admission's per-kind rules. ``rules`` holds what a kind may declare (``KindRules``), ``lookup``
finds an entry's (``rules_of``); each built-in kind's module here, named after it, holds its
``RULES``. The generic walks (``consistency``, ``consistency_walks``, ``admission_work``) read them."""
