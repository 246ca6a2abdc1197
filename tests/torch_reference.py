"""PyTorch's own answer for the training tests: a plain SGD loop, torch autograd, no ortlab or ORT
in it. A model returns its loss from `model(*batch)`."""
import torch


def sgd_losses(model, batches, steps, lr=0.05, zero_grad=True):
    """The loss of each of `steps` SGD steps on `model` (trained in place), cycling through `batches`.
    zero_grad=False leaves the gradients accumulating (the planted bug of D_02)."""
    optimizer, losses = torch.optim.SGD(model.parameters(), lr=lr), []
    for step in range(steps):
        if zero_grad:
            optimizer.zero_grad()
        loss = model(*batches[step % len(batches)])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
