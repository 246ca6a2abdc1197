"""Reference answers to the exercises of notebooks/L0_06_per_op_gradients.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "div_gradient": '''
d_a = b.emit("Div", [b.GO(0), b.I(1)])                                      # dY / B
d_b = b.emit("Neg", [b.emit("Div", [b.emit("Mul", [b.GO(0), b.O(0)]), b.I(1)])])  # -dY · Y / B = -dY · A / B²
return [b.handle_broadcasting(d_a, b.I(0)), b.handle_broadcasting(d_b, b.I(1))]
''',
    "gemm_grad": '''
return {"A": ("Y_grad", "B", 0, 0, 0.5),   # dA = alpha · dY · B
        "B": ("Y_grad", "A", 1, 0, 0.5)}   # dB = alpha · dYᵀ · A
''',
}

MISTAKES = {
    "div_gradient": [
        ('''
d_a = b.emit("Div", [b.GO(0), b.I(1)])
d_b = b.emit("Div", [b.emit("Mul", [b.GO(0), b.O(0)]), b.I(1)])  # the minus sign forgotten
return [b.handle_broadcasting(d_a, b.I(0)), b.handle_broadcasting(d_b, b.I(1))]
''', "the sign is missing"),
        ('''
d_a = b.emit("Div", [b.GO(0), b.I(1)])
d_b = b.emit("Neg", [b.emit("Div", [b.emit("Mul", [b.GO(0), b.O(0)]), b.I(1)])])
return [d_a, d_b]  # not reduced over the broadcast axes
''', "sum its gradient over those axes"),
        ('''
d_a = b.emit("Div", [b.GO(0), b.I(1)])
d_b = b.emit("Neg", [b.emit("Div", [b.GO(0), b.emit("Mul", [b.I(1), b.I(1)])])])  # -dY / B², A forgotten
return [b.handle_broadcasting(d_a, b.I(0)), b.handle_broadcasting(d_b, b.I(1))]
''', "without A"),
        ('''
d_a = b.emit("Mul", [b.GO(0), b.I(1)])  # Mul's gradient
d_b = b.emit("Neg", [b.emit("Div", [b.emit("Mul", [b.GO(0), b.O(0)]), b.I(1)])])
return [b.handle_broadcasting(d_a, b.I(0)), b.handle_broadcasting(d_b, b.I(1))]
''', "Mul's gradient"),
        ('''
outputs = [b.GI(0), b.GI(1)]
b.emit("DivGrad", [b.GO(0), b.I(0), b.I(1)], outputs, domain="com.microsoft")
return outputs
''', "with ONNX ops"),
    ],
    "gemm_grad": [
        ('''
return {"A": ("Y_grad", "B", 0, 1, 0.5),  # B transposed again
        "B": ("Y_grad", "A", 1, 0, 0.5)}
''', "B as it is"),
        ('''
return {"A": ("Y_grad", "B", 0, 0, 1.0),  # alpha left out
        "B": ("Y_grad", "A", 1, 0, 1.0)}
''', "so does the gradient"),
        ('''
return {"A": ("Y_grad", "B", 0, 0, 0.5),
        "B": ("A", "Y_grad", 1, 0, 0.5)}  # Aᵀ · dY, the gradient of a B that was not transposed
''', "the transpose of alpha · Aᵀ · dY"),
        ('''
return {"A": ("Y_grad", "B", 0, 0, 0.5),
        "B": ("Y_grad", "W", 1, 0, 0.5)}
''', "a Gemm input is one of"),
    ],
}
