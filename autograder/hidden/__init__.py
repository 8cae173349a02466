"""Hidden tests, one file per exercise (``test_KEY.py``); see README.md here."""
