"""ONNX import: eggfuse.onnx.load, eggfuse.onnx.Model, the backend for onnx's test runner."""
