"""Why the AP is what it is: TIDE error types, the confusion matrix, AP and recall by object size
next to the anchor coverage, the worst images and advice, from a COCO-format evaluation."""
