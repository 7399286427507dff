"""The public side of the outbox recipe: a registration form that records a row and kicks, and one-click unsubscribe.

A view calls no outside service and sends no e-mail: it records what to do and kicks the job that does it.
"""

from django.db import transaction
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from fabrika_django import TokenExpired, TokenInvalid, kick
from fabrika_django.tokens import verify

from .forms import RegistrationForm, ResendForm
from .models import Person


def register(request):
    form = RegistrationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            form.save()
            kick("register")  # goes out once this transaction commits; a rollback kicks nothing
        return redirect("outbox:thanks")
    return render(request, "outbox/register.html", {"form": form})


def thanks(request):
    return render(request, "outbox/thanks.html")


@require_http_methods(["GET", "POST"])
def resend_welcome(request):
    """Enqueue the Django task that resends a person's welcome mail; the page never says whether one exists."""
    from .tasks import resend_welcome  # Django tasks are optional on Django 5.2 (the backport)

    form = ResendForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        person = Person.objects.filter(email=form.cleaned_data["email"]).first()
        if person is not None:
            with transaction.atomic():
                resend_welcome.enqueue(person.pk)  # a row in this transaction; its job is kicked on commit
        # Post/Redirect/Get: reloading the confirmation asks for the page again, it does not send the mail again.
        return redirect("outbox:resent")
    return render(request, "outbox/resend.html", {"form": form})


def resent(request):
    return render(request, "outbox/resent.html")


# RFC 8058: a mailbox unsubscribes with a POST that carries no CSRF token; the signed token is the authority.
@csrf_exempt
@require_http_methods(["GET", "POST"])
def unsubscribe(request):
    """GET shows a page with a button (link scanners follow GETs); POST unsubscribes."""
    token = request.GET.get("t", "")
    try:
        claims = verify("unsubscribe", token)
        person = Person.objects.get(pk=claims.get("person"))
    except TokenExpired:
        return render(request, "outbox/unsubscribe_invalid.html", {"expired": True}, status=400)
    except (TokenInvalid, Person.DoesNotExist, ValueError, TypeError):
        return render(request, "outbox/unsubscribe_invalid.html", {"expired": False}, status=400)
    if request.method == "POST":
        Person.objects.filter(pk=person.pk).update(unsubscribed=True)
        return render(request, "outbox/unsubscribed.html")
    return render(request, "outbox/unsubscribe.html", {"token": token})
