"""The export formats and their files' names, without TensorFlow: a command's --help lists them
(serving/tflite_export.py and serving/onnx_export.py write the files)."""

SAVED_MODEL = 'saved_model'
TFLITE_FILES = {'tflite_fp32': 'model_fp32.tflite', 'tflite_fp16': 'model_fp16.tflite',
                'tflite_int8': 'model_int8.tflite'}
ONNX_FILES = {'onnx_fp32': 'model_fp32.onnx'}
NETWORK_FILES = dict(TFLITE_FILES, **ONNX_FILES)
FORMATS = (SAVED_MODEL,) + tuple(NETWORK_FILES)
DEFAULT_CALIBRATION_COUNT = 200
