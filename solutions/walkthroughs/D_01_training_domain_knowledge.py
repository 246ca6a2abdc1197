"""Reference answers to the exercises of notebooks/D_01_training_domain_knowledge.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "global_norm_clip": '''
total = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))  # one norm over all gradients
scale = min(1.0, max_norm / (total + 1e-6))  # only ever shrinks
return [g * scale for g in grads]
''',
    "loss_scaler": '''
scales, stable = [], 0
for finite in finite_flags:
    if finite:
        stable += 1
        if stable >= up_scale_window:  # the window-th finite step in a row doubles it
            loss_scale, stable = min(max_loss_scale, loss_scale * 2), 0
    else:  # an overflow halves it, and the count starts again
        loss_scale, stable = max(min_loss_scale, loss_scale / 2), 0
    scales.append(loss_scale)
return scales
''',
}

MISTAKES = {
    "global_norm_clip": [
        ('''
return [g * min(1.0, max_norm / float(g.norm())) if float(g.norm()) else g for g in grads]
''', "over all gradients together"),
        ('''
total = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
return [g * max_norm / total for g in grads]
''', "exceeds max_norm"),
        ('''
total = sum(float(g.norm()) for g in grads)
return [g * min(1.0, max_norm / total) for g in grads]
''', "not the sum of their norms"),
        ('''
return [g.clamp(-max_norm, max_norm) for g in grads]
''', "clip_grad_value_"),
        ('''
return math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
''', "return a list with the clipped gradients"),
    ],
    "loss_scaler": [
        ('''
scales, stable = [], 0
for finite in finite_flags:
    if finite:
        stable += 1
        if stable >= up_scale_window:
            loss_scale, stable = min(max_loss_scale, loss_scale * 2), 0
    else:
        loss_scale = max(min_loss_scale, loss_scale / 2)  # the count of finite steps goes on
    scales.append(loss_scale)
return scales
''', "starts again from 0 after an overflow"),
        ('''
scales = []
for finite in finite_flags:
    loss_scale = min(max_loss_scale, loss_scale * 2) if finite else max(min_loss_scale, loss_scale / 2)
    scales.append(loss_scale)
return scales
''', "doubles only after 3 finite steps in a row"),
        ('''
scales, stable = [], 0
for finite in finite_flags:
    if finite:
        stable += 1
        if stable >= up_scale_window:
            loss_scale = min(max_loss_scale, loss_scale * 2)  # the count is not reset
    else:
        loss_scale, stable = max(min_loss_scale, loss_scale / 2), 0
    scales.append(loss_scale)
return scales
''', "after each doubling"),
        ('''
scales, stable = [], 0
for finite in finite_flags:
    if finite:
        stable += 1
        if stable > up_scale_window:
            loss_scale, stable = min(max_loss_scale, loss_scale * 2), 0
    else:
        loss_scale, stable = max(min_loss_scale, loss_scale / 2), 0
    scales.append(loss_scale)
return scales
''', "the window-th finite step in a row doubles"),
        ('''
scales, stable = [], 0
for finite in finite_flags:
    if finite:
        stable += 1
        if stable >= up_scale_window:
            loss_scale, stable = min(max_loss_scale, loss_scale * 2), 0
    else:
        loss_scale, stable = loss_scale / 2, 0
    scales.append(loss_scale)
return scales
''', "never below min_loss_scale"),
        ('''
scales, stable = [], 0
for finite in finite_flags:
    if finite:
        stable += 1
        if stable >= up_scale_window:
            loss_scale, stable = loss_scale * 2, 0
    else:
        loss_scale, stable = max(min_loss_scale, loss_scale / 2), 0
    scales.append(loss_scale)
return scales
''', "never above it"),
    ],
}
