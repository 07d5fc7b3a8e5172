"""File safety helpers (mmunlearn/files/): atomic writes."""
