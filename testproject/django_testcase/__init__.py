"""Tests run by Django's own runner (``manage.py test testproject.django_testcase``), not by pytest.

They show that the test kit works without pytest: ``tests/test_testing.py`` runs them in a subprocess.
"""
