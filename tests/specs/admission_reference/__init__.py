"""The pre-refactor reference of admission: a frozen copy of ``specs/consistency.py``,
``specs/consistency_walks.py``, ``specs/effects.py`` and ``specs/admission_work.py`` as they stood
before admission became generic over the kinds' declarations (issue 48). The oracle of
``test_admission_same_verdicts``: never edited, never imported by the package."""
