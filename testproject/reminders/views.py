"""Create a reminder, and move one (``requeue(at=...)``): the ``send_reminders`` job sends it when it is due."""

from django import forms
from django.contrib import messages
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from fabrika_django import VersionConflict, kick

from .models import Reminder


class ReminderForm(forms.Form):
    note = forms.CharField(max_length=200)
    email = forms.EmailField()
    due = forms.DateTimeField(widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))


class MoveForm(forms.Form):
    due = forms.DateTimeField(widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))


def _kick_if_due(due):
    # A reminder due now need not wait for the next minute's fire.
    if due <= timezone.now():
        kick("send_reminders")


def index(request):
    form = ReminderForm(request.POST or None, initial={"due": timezone.localtime().replace(second=0, microsecond=0)})
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            Reminder.objects.create(
                note=form.cleaned_data["note"], email=form.cleaned_data["email"], due=form.cleaned_data["due"]
            )
            _kick_if_due(form.cleaned_data["due"])
        messages.success(request, "Reminder saved.")
        return redirect("reminders:index")
    reminders = Reminder.objects.order_by("-pk")[:50]
    return render(request, "reminders/index.html", {"form": form, "reminders": reminders, "move": MoveForm()})


@require_POST
def move(request, pk):
    reminder = get_object_or_404(Reminder, pk=pk)
    form = MoveForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give the new time as a date and time.")
        return redirect("reminders:index")
    try:
        with transaction.atomic():
            reminder.requeue(at=form.cleaned_data["due"])
            _kick_if_due(form.cleaned_data["due"])
    except VersionConflict:
        messages.error(request, f"Reminder {pk} changed meanwhile: look at it again and move it again.")
    else:
        messages.success(request, f"Reminder {pk} moved.")
    return redirect("reminders:index")
