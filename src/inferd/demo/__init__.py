"""Demo model repository builders (ONNX models generated locally from code)."""
