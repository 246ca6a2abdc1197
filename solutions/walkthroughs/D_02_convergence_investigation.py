"""Reference answers to the exercises of notebooks/D_02_convergence_investigation.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "lr_zero": '''
return {"dropout": False,  # a new mask at every forward
        "no_zero_grad": True,  # piled-up gradients times lr 0 move nothing
        "weight_decay": True,  # AdamW's decay is scaled by lr too
        "batchnorm": True,  # train mode reads the batch's statistics, not the running ones
        "warmup": False}  # the scheduler raises the lr after the first step
''',
    "grad_parity": '''
largest = max(float(np.abs(g).max()) for g in reference.values())  # the model's gradient scale
return {name for name, g in reference.items()
        if not np.allclose(ours[name], g, rtol=1e-4, atol=1e-5 * largest)}
''',
}

MISTAKES = {
    "lr_zero": [
        ('''
return {"dropout": False, "no_zero_grad": False, "weight_decay": True, "batchnorm": True, "warmup": False}
''', "multiplies them by lr = 0"),
        ('''
return {"dropout": False, "no_zero_grad": True, "weight_decay": False, "batchnorm": True, "warmup": False}
''', "scaled by lr too"),
        ('''
return {"dropout": False, "no_zero_grad": True, "weight_decay": True, "batchnorm": False, "warmup": False}
''', "read only in eval mode"),
        ('''
return {"dropout": False, "no_zero_grad": True, "weight_decay": True, "batchnorm": True, "warmup": True}
''', "schedulers included"),
        ('''
return {"dropout": True, "no_zero_grad": True, "weight_decay": True, "batchnorm": True, "warmup": False}
''', "new mask at every forward"),
    ],
    "grad_parity": [
        ('''
return {name for name, g in reference.items() if not np.array_equal(ours[name], g)}
''', "not equal bit for bit"),
        ('''
return {name for name, g in reference.items() if np.abs(ours[name] - g).max() > 5e-5}
''', "relative to the values"),
        ('''
return {name for name, g in reference.items() if np.abs(ours[name] - g).max() > 1e-4 * np.abs(g).max()}
''', "zero in exact arithmetic"),
        ('''
largest = max(float(np.abs(g).max()) for g in reference.values())
if all(np.allclose(ours[name], g, rtol=1e-4, atol=1e-5 * largest) for name, g in reference.items()):
    return set()
return set(reference)  # one verdict for the whole model
''', "compare each parameter separately"),
        ('''
return max(float(np.abs(ours[name] - g).max()) for name, g in reference.items())
''', "return a set of parameter names"),
    ],
}
