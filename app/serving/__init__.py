"""How processes start: ``python -m app`` (:mod:`app.serving.main`), the application factory that wires
model, engine, cache, tasks and both protocols together (:mod:`app.serving.factory`), uvicorn with a
drain (:mod:`app.serving.server`), and several workers on one port (:mod:`app.serving.supervisor`,
:mod:`app.serving.cluster`)."""
