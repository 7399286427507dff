import traceback
import pytest
from django.db import connection
from testproject.lab import tasks
pytestmark = pytest.mark.django_db(transaction=True)
def test_dbg(monkeypatch):
    real = connection._commit
    def commit():
        traceback.print_stack(limit=6)
        return real()
    monkeypatch.setattr(connection, "_commit", commit)
    tasks.noop.enqueue()
    assert 0
