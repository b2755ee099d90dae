"""HTTP: thin routes (TEI's, ours, OpenAI's), the gates every request passes (draining, keys, urgency, body
limit, request metrics), the one-function data path that runs them in front of the rest, and client
disconnects."""
