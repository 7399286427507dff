"""The LISTEN/NOTIFY channel kicks are sent on, apart so that the listener needs no model to know it."""

#: Versioned so workers of another release never misread a payload.
CHANNEL = "fabrika_kick_v1"
