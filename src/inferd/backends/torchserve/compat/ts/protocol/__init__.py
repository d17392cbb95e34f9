"""``ts.protocol``: where older handlers import the intermediate-answer call from."""
