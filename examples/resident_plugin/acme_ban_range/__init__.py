"""A worked plug-in: ``acme.ban_range`` (resident) and ``acme.no_repeat_ngram`` (per row)."""
