"""Signed tokens per purpose (ctx.tokens, and sign/verify for views) and ctx.url."""

from datetime import UTC, datetime, timedelta

import pytest

from fabrika_django.exceptions import TokenExpired, TokenInvalid
from fabrika_django.testing import run_job
from fabrika_django.tokens import sign, verify

from .jobs_helpers import temporary_job

NOON = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def test_a_token_carries_its_claims_for_its_purpose_until_it_expires():
    token = sign("unsubscribe", {"person": 7}, days=400, now=NOON)
    assert verify("unsubscribe", token, now=NOON + timedelta(days=399)) == {"person": 7}
    with pytest.raises(TokenExpired, match="The link has expired"):
        verify("unsubscribe", token, now=NOON + timedelta(days=400))


def test_a_token_of_another_purpose_or_tampered_or_cut_is_invalid():
    token = sign("unsubscribe", {"person": 7}, days=1, now=NOON)
    for purpose, text in [("confirm", token), ("unsubscribe", token[:-2]), ("unsubscribe", token + "x")]:
        with pytest.raises(TokenInvalid) as refused:
            verify(purpose, text, now=NOON)
        assert type(refused.value) is TokenInvalid
        assert str(refused.value) == "The link's token is not valid: open the link from the e-mail whole."
    with pytest.raises(TokenInvalid, match="missing"):
        verify("unsubscribe", "", now=NOON)


def test_a_token_signed_with_another_secret_key_is_invalid(settings):
    token = sign("unsubscribe", {"person": 7}, days=1)
    settings.SECRET_KEY = "another secret key of enough length to be a django secret key"
    with pytest.raises(TokenInvalid):
        verify("unsubscribe", token)


@pytest.mark.parametrize("days", [0, -1, 3651, "400", None, True])
def test_days_must_be_a_life_above_zero_of_at_most_ten_years(days):
    with pytest.raises(ValueError, match="is not a token's life"):
        sign("unsubscribe", {"person": 7}, days=days)


def test_claims_must_be_a_dict_of_json_values():
    with pytest.raises(TypeError, match="must be a dict"):
        sign("unsubscribe", [7], days=1)
    with pytest.raises(TypeError, match="must be JSON values"):
        sign("unsubscribe", {"when": NOON}, days=1)


@pytest.mark.django_db
def test_ctx_tokens_sign_on_the_runs_clock_for_declared_purposes_only():
    tokens = []

    def issuing(ctx):
        tokens.append(ctx.tokens.sign("unsubscribe", {"person": 3}, days=2))
        tokens.append(ctx.tokens.verify("unsubscribe", tokens[0]))
        ctx.tokens.sign("confirm", {"person": 3}, days=2)

    with temporary_job(issuing, signs=["unsubscribe"]):
        assert run_job("issuing", now=NOON).outcome == "capability_refused"
    assert tokens[1] == {"person": 3}
    assert verify("unsubscribe", tokens[0], now=NOON + timedelta(days=1)) == {"person": 3}
    with pytest.raises(TokenExpired):
        verify("unsubscribe", tokens[0], now=NOON + timedelta(days=2))


@pytest.mark.django_db
def test_ctx_url_is_absolute_from_base_url_with_the_query_encoded(settings):
    settings.FABRIKA = dict(settings.FABRIKA, BASE_URL="https://demo.example/")
    urls = []

    def linking(ctx):
        urls.append(ctx.url("outbox:unsubscribe", query={"t": "a b&c"}))
        urls.append(ctx.url("reports:detail", kwargs={"pk": 4}))
        ctx.url("outbox:nowhere")

    with temporary_job(linking):
        assert run_job("linking").failure == "handler_failed"
    assert urls == ["https://demo.example/unsubscribe/?t=a+b%26c", "https://demo.example/reports/4/"]


def test_an_unknown_view_name_says_what_to_name():
    from fabrika_django.tokens import absolute_url

    with pytest.raises(ValueError, match="No URL named 'outbox:nowhere'"):
        absolute_url("outbox:nowhere")
