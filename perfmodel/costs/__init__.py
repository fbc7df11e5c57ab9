"""Closed-form costs: time of one op or one collective given fitted parameters; memory accounting."""
