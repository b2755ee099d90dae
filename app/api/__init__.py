"""HTTP layer: schemas, thin routes and the body-size guard."""
