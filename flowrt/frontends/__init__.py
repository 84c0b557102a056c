"""Front ends: model formats imported as flowrt Networks."""
