app_name = "reminders"
urlpatterns: list = []
