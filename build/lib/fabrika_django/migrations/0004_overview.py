from django.db import migrations


class Migration(migrations.Migration):
    """The admin's overview entry: a proxy of Job, no table."""

    dependencies = [
        ("fabrika_django", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Overview",
            fields=[],
            options={
                "verbose_name": "overview",
                "verbose_name_plural": "overview",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("fabrika_django.job",),
        ),
    ]
