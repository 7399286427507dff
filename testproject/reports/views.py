"""Ask for a report (a request row and a kick), watch its page until the job is done, then download the file."""

from django import forms
from django.db import transaction
from django.http import FileResponse, Http404
from django.shortcuts import get_object_or_404, redirect, render

from fabrika_django import kick

from .models import ReportRequest


class ReportForm(forms.Form):
    rows = forms.IntegerField(min_value=1, max_value=100_000, initial=1000)


def index(request):
    form = ReportForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            report = ReportRequest.objects.create(rows=form.cleaned_data["rows"])
            kick("render_reports")  # goes out once this transaction commits
        return redirect("reports:detail", pk=report.pk)
    recent = ReportRequest.objects.order_by("-pk")[:20]
    return render(request, "reports/index.html", {"form": form, "recent": recent})


def detail(request, pk):
    report = get_object_or_404(ReportRequest, pk=pk)
    return render(request, "reports/detail.html", {"report": report})


def download(request, pk):
    report = get_object_or_404(ReportRequest, pk=pk)
    if report.state != "done" or not report.result:
        raise Http404("The report is not ready yet.")
    return FileResponse(report.result.open("rb"), as_attachment=True, filename=f"report-{report.pk}.csv")
