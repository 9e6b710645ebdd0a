"""The planner (DESIGN.md section 12): each strategy's epoch time on a measured or simulated cluster, ranked.

`costs` says what a cluster costs, `predict` turns a strategy's schedule into epoch seconds,
`plan` ranks the strategies and says why, `profile` measures a real cluster on the cell's model.
"""
