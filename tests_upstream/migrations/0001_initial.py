# The proxy DBTaskResult (models.py): no table, but a migrated app's model must be in a migration to be rendered.
from django.db import migrations


class Migration(migrations.Migration):
    initial = True
    dependencies = [("fabrika_django", "__latest__")]

    operations = [
        migrations.CreateModel(
            name="DBTaskResult",
            fields=[],
            options={"ordering": ["-priority", "due", "id"], "proxy": True, "indexes": [], "constraints": []},
            bases=("fabrika_django.queuedtask",),
        ),
    ]
