"""Benchmark ``ctx.mail.send`` against the transport's own limit: plain smtplib to an SMTP server on loopback.

    .venv/bin/python -m bench.mail [--messages 1000] [--repeat 3] [--database-url postgres://…/fabrika_bench_mail]

An aiosmtpd server on 127.0.0.1 takes every message (and keeps nothing). The same messages (text and HTML parts,
distinct keys) go out three ways, interleaved and repeated; the median run counts:

- ``smtplib``: ``SMTP.sendmail`` of each message's bytes over one connection: the floor of any Python sender;
- ``django``: Django's SMTP ``EmailBackend.send_messages([message])`` per message over one open connection;
- ``ctx.mail``: a registered job run by ``fabrika_django.runner.run`` calling ``ctx.mail.send(...)`` per message:
  the checks, the content hash, the ledger's two short transactions and the NOOP probe before each reuse.

Then ``ctx.mail (replay)``: the same keys again, each answered from the ledger with nothing sent. It prints
messages/s, each way's share of smtplib's, per-message latency percentiles and the process's peak RSS.
A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import smtplib
import socket
import statistics
import time

from bench._setup import create_database, out, setup_django

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/fabrika_bench_mail"
SENDER = "bench@localhost"
TO = "inbox@example.org"


class _Sink:
    """Takes every message and keeps only a count."""

    def __init__(self) -> None:
        self.count = 0

    async def handle_DATA(self, server, session, envelope):
        self.count += 1
        return "250 OK"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _contents(count: int) -> list[dict]:
    return [
        {
            "to": TO,
            "subject": f"Bench message {n}",
            "text": f"Hello,\n\nthis is message {n} of the bench.\n" * 5,
            "html": f"<p>Hello,</p><p>this is message {n} of the bench.</p>" * 5,
            "idempotency_key": f"bench-mail-{n}",
        }
        for n in range(count)
    ]


def _django_message(content: dict):
    from django.core.mail import EmailMultiAlternatives

    message = EmailMultiAlternatives(content["subject"], content["text"], SENDER, [content["to"]])
    message.attach_alternative(content["html"], "text/html")
    return message


def _timed(send, items) -> dict:
    latencies = []
    started = time.perf_counter()
    for item in items:
        before = time.perf_counter()
        send(item)
        latencies.append(time.perf_counter() - before)
    return {"seconds": time.perf_counter() - started, "latencies": latencies}


def _way_smtplib(port: int, contents: list[dict]) -> dict:
    raw = [_django_message(content).message().as_bytes(linesep="\r\n") for content in contents]
    with smtplib.SMTP("127.0.0.1", port) as session:
        return _timed(lambda data: session.sendmail(SENDER, [TO], data), raw)


def _way_django(port: int, contents: list[dict]) -> dict:
    from django.core.mail.backends.smtp import EmailBackend

    backend = EmailBackend(host="127.0.0.1", port=port, use_tls=False, fail_silently=False)
    messages = [_django_message(content) for content in contents]
    backend.open()
    try:
        return _timed(lambda message: backend.send_messages([message]), messages)
    finally:
        backend.close()


def _way_ctx_mail(port: int, contents: list[dict], *, replay: bool = False) -> dict:
    from django.test import override_settings

    from fabrika_django import cron, runner
    from fabrika_django.jobs import registry
    from fabrika_django.models import SentMail

    if not replay:
        SentMail.objects.all().delete()
    box: dict = {}

    def bench_mail(ctx):
        box.update(_timed(lambda content: ctx.mail.send(**content), contents))

    cron(None, mailer="installation")(bench_mail)
    smtp = {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": port,
        "EMAIL_USE_TLS": False,
        "EMAIL_HOST_USER": "",
        "EMAIL_HOST_PASSWORD": "",
        "DEFAULT_FROM_EMAIL": SENDER,
    }
    try:
        with override_settings(**smtp):
            outcome = runner.run("bench_mail", "manual").outcome
    finally:
        registry.unregister("bench_mail")
    if outcome != "succeeded":
        raise SystemExit(f"the bench job ended {outcome}")
    return box


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _ms(values: list[float], q: float) -> str:
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    args = parser.parse_args(argv)

    from aiosmtpd.controller import Controller

    create_database(args.database_url)
    setup_django(args.database_url, lab=False)
    sink = _Sink()
    port = _free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    contents = _contents(args.messages)
    ways = {
        "smtplib": lambda: _way_smtplib(port, contents),
        "django": lambda: _way_django(port, contents),
        "ctx.mail": lambda: _way_ctx_mail(port, contents),
        "ctx.mail (replay)": lambda: _way_ctx_mail(port, contents, replay=True),
    }
    runs: dict[str, list[dict]] = {name: [] for name in ways}
    try:
        for _ in range(args.repeat):
            for name, way in ways.items():
                runs[name].append(way())
    finally:
        controller.stop()

    expected = args.messages * 3 * args.repeat  # the replay sends nothing
    out(f"{args.messages} messages a run, {args.repeat} runs a way; server took {sink.count} ({expected} expected)")
    out(f"{'way':<20}{'msg/s':>10}{'range':>18}{'of smtplib':>12}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}")
    floor = None
    for name, results in runs.items():
        rates = sorted(args.messages / result["seconds"] for result in results)
        median = statistics.median(rates)
        middle = min(results, key=lambda result: abs(args.messages / result["seconds"] - median))
        floor = floor or median
        out(
            f"{name:<20}{median:>10.0f}{f'{rates[0]:.0f}-{rates[-1]:.0f}':>18}{median / floor:>11.0%}"
            f"{_ms(middle['latencies'], 0.5):>9}{_ms(middle['latencies'], 0.95):>9}{_ms(middle['latencies'], 0.99):>9}"
        )
    out(f"peak RSS of the process: {_peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
