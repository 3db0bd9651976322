import torch

layer = torch.nn.Linear(4, 4)
