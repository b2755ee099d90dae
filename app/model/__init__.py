"""The model behind a small interface: resolve a folder, load and run its ONNX graphs, tokenize."""
