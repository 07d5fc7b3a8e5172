"""Records, regenerated docs tables and figures (mmunlearn/report/, mmunlearn report)."""
