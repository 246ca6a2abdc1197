"""Reference answers to the exercises of notebooks/L1_07_ortmodule_optimizations.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "label_sparsity": '''
return {"padded_with_ignore_index": "ON",  # 14 of 20 valid: 70%
        "padded_with_zero": "OFF",  # 0 is not the ignore_index: 100%
        "two_ignored": "OFF",  # 18 of 20: 90%, not below 90
        "ignore_index_zero": "ON",  # this loss ignores 0: 70%
        "functional_loss": None}  # no CrossEntropyLoss module, no hook
''',
    "fused_adam_step": '''
m = beta1 * m + (1 - beta1) * g
v = beta2 * v + (1 - beta2) * g * g
lr_corrected = lr * np.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
p = p - lr_corrected * m / (np.sqrt(v) + eps)
p = p - lr * weight_decay * p  # decoupled decay, after the update
return p, m, v
''',
}

MISTAKES = {
    "label_sparsity": [
        ('''
return {"padded_with_ignore_index": "ON", "padded_with_zero": "ON", "two_ignored": "OFF",
        "ignore_index_zero": "ON", "functional_loss": None}
''', "marked with ignore_index"),
        ('''
return {"padded_with_ignore_index": "ON", "padded_with_zero": "OFF", "two_ignored": "ON",
        "ignore_index_zero": "ON", "functional_loss": None}
''', "only below 90%"),
        ('''
return {"padded_with_ignore_index": "ON", "padded_with_zero": "OFF", "two_ignored": "OFF",
        "ignore_index_zero": "OFF", "functional_loss": None}
''', "reads ignore_index from the module"),
        ('''
return {"padded_with_ignore_index": "ON", "padded_with_zero": "OFF", "two_ignored": "OFF",
        "ignore_index_zero": "ON", "functional_loss": "ON"}
''', "forward pre-hook"),
    ],
    "fused_adam_step": [
        ('''
p = p * (1 - lr * weight_decay)
m = beta1 * m + (1 - beta1) * g
v = beta2 * v + (1 - beta2) * g * g
denom = np.sqrt(v) / np.sqrt(1 - beta2 ** step) + eps
return p - lr / (1 - beta1 ** step) * m / denom, m, v
''', "ADAMW_TORCH"),
        ('''
m = beta1 * m + (1 - beta1) * g
v = beta2 * v + (1 - beta2) * g * g
p = p - lr * weight_decay * p
p = p - lr * np.sqrt(1 - beta2 ** step) / (1 - beta1 ** step) * m / (np.sqrt(v) + eps)
return p, m, v
''', "decays after it"),
        ('''
m = beta1 * m + (1 - beta1) * g
v = beta2 * v + (1 - beta2) * g * g
p = p - lr * m / (np.sqrt(v) + eps)
return p - lr * weight_decay * p, m, v
''', "bias_correction=True"),
        ('''
m = beta1 * m + (1 - beta1) * g
v = beta2 * v + (1 - beta2) * g * g
p = p - lr / (1 - beta1 ** step) * m / (np.sqrt(v) / np.sqrt(1 - beta2 ** step) + eps)
return p - lr * weight_decay * p, m, v
''', "adds eps to sqrt(v) itself"),
        ('''
m = beta1 * m + (1 - beta1) * g
v = beta2 * v + (1 - beta2) * g
lr_corrected = lr * np.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
p = p - lr_corrected * m / (np.sqrt(v) + eps)
return p - lr * weight_decay * p, m, v
''', "v = beta2 * v + (1 - beta2) * g * g"),
    ],
}
