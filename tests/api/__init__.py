"""The library face mmunlearn.unlearn / restore (mmunlearn/api/) on tiny speaker, speech-LLM and text models."""
