"""Hand-written SQL: every statement fabrika sends, named, once per vendor where the vendors differ."""
