"""The exported model behind a small interface: find or export its folder (:mod:`~app.model.resolve`),
read its manifest, the contract with the export stage (:mod:`~app.model.manifest`), load and run its
ONNX graphs (:mod:`~app.model.runtime`; on a grid of batch shapes, :mod:`~app.model.grid`,
:mod:`~app.model.shaped`, with IOBinding and CUDA graphs, :mod:`~app.model.binding`), tokenize
(:mod:`~app.model.tokenizer`), and run its sentence-transformers Dense modules (:mod:`~app.model.dense`)."""
