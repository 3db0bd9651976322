import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        return self.fc(x)


model = Net()


def example_inputs():
    return (torch.zeros(2, 3),)  # wrong width: fc expects 4 features
