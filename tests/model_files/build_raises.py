def build_model():
    raise ValueError("hidden size must be divisible by heads")
