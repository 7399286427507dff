from django import forms

from .models import Registration


class RegistrationForm(forms.ModelForm):
    class Meta:
        model = Registration
        fields = ("name", "email")


class ResendForm(forms.Form):
    email = forms.EmailField()
