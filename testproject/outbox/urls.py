app_name = "outbox"
urlpatterns: list = []
