"""The labs' checks: reference answers and what a wrong answer is told, one module per lab.

Each function here takes a remote (ortlab.labs.remote) and the learner's objects, reaches those only
through remote.call (data both ways), and returns None (pass) or why not (ortlab.labs.checks.evaluate).
The grader runs them in its own process; a lab module (ortlab.labs.labNN) imports none of them: its
checks name them for ortlab.labs.checks.judge.
"""
