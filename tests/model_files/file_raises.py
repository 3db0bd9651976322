import torch

x = 1
raise RuntimeError("config file not found")
