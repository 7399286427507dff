from django.urls import path

from . import views

app_name = "outbox"
urlpatterns = [
    path("", views.register, name="register"),
    path("thanks/", views.thanks, name="thanks"),
    path("unsubscribe/", views.unsubscribe, name="unsubscribe"),
    path("resend/", views.resend_welcome, name="resend"),
    path("resend/sent/", views.resent, name="resent"),
]
