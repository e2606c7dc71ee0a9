"""Cost model: predicted step time of one CP attention layer on a hardware profile. Pure
Python, by job:

- prediction.py: `predict` and what it returns (`Prediction`), the model's inputs and rules;
- breakdown.py: the pieces of a prediction (`PhaseTime`, `TierTraffic`, `CommTerm`);
- placement.py: where the CP groups sit on nodes and which link tier each collective uses;
- work.py: the work of every ring step under the layout and mask, and its memory-bound bytes;
- schemes.py: the time of a phase for each scheme (Ulysses all-to-alls, ring hops,
  all-gather strides) and its linear communication terms;
- records.py: the prediction of a results record (`prediction_for_record`).
"""
